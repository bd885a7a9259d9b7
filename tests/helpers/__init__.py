"""What the tests share besides fixtures (those are in tests/conftest.py): the shared and bundled real captures
(``paths``), synthetic exports built from nsys's real DDL (``synth``, ``eagle_synth``), SQLite files as a killed
writer leaves them (``killed_writer``) and the fake SGLang's recorder (``fake_hooks``).

Import them as ``from tests.helpers.paths import tp2`` (pyproject's ``pythonpath = ["."]`` puts the checkout on
the path; scripts run from the repository root find them the same way)."""
