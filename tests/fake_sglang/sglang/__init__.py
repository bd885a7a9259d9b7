"""Fake SGLang for spectrace hook tests: module paths, class names and call order only."""
