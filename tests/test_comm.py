"""The communication kernel table: real kernel names (sglang-eagle3.md §5, real traces) → family."""

from __future__ import annotations

import pytest

from analyze.compute.comm_patterns import PATTERNS, classify, load_patterns
from analyze.model import InputError

COMM = {
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)": "nccl",
    "ncclDevKernel_AllGather_RING_LL(ncclDevComm *, unsigned long, ncclWork *)": "nccl",
    "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL": "nccl",
    "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)": "nccl",
    "ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclDevComm *, unsigned long, ncclWork *)": "nccl",
    "ncclSymkDevKernel_AllReduce_AGxLLMC_R_sum_bf16": "nccl",
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData *, vllm::RankSignals, vllm::Signal *, __nv_bfloat16 *, int, int)": "custom_ar",
    "void sglang::cross_device_reduce_2stage<__half, 8>(sglang::RankData *, sglang::RankSignals, sglang::Signal *, __half *, int, int)": "custom_ar",
    "void trt_llm::oneShotAllReduceKernel<__nv_bfloat16, 8, true>(trt_llm::AllReduceParams)": "custom_ar",
    "void trt_llm::twoShotAllReduceKernel<__nv_bfloat16, 8, true>(trt_llm::AllReduceParams)": "custom_ar",
    "void (anonymous namespace)::all_reduce_one_shot_kernel<__nv_bfloat16, 8>(...)": "custom_ar",
    "void (anonymous namespace)::all_reduce_two_shot_kernel<__nv_bfloat16, 8>(...)": "custom_ar",
    "void (anonymous namespace)::all_reduce_one_shot_push_kernel<__nv_bfloat16, 8>(...)": "custom_ar",
    "void sglang::all_reduce_kernel<__nv_bfloat16, 8>(...)": "custom_ar",
    "void sglang::all_reduce_1shot_push_kernel<__nv_bfloat16, 8>(...)": "custom_ar",
    "void sglang::all_reduce_2shot_pull_kernel<__nv_bfloat16, 8>(...)": "custom_ar",
    "void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<(AllReduceFusionPattern)1, __nv_bfloat16, 8, true>(...)": "flashinfer_ar",
    "void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_twoshot_sync<(AllReduceFusionPattern)1, __nv_bfloat16, 8>(...)": "flashinfer_ar",
    "void (anonymous namespace)::two_shot_all_reduce_kernel_inplace<c10::BFloat16, 16, 8>(...)": "torch_symm_mem",
    "void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 8>(...)": "torch_symm_mem",
    "void sglang::allreduce_1shotLL_1node<__nv_bfloat16>(...)": "mscclpp",
    "void deep_ep::intranode::dispatch<8, 768, 8192>(...)": "ep_alltoall",
    "void quickreduce::allreduce_prototype_twoshot<__half, 8>(...)": "quick_ar",
    "void (anonymous namespace)::reduce_scatter_kernel<float, 8>(...)": "collective",
    "[CUDA memcpy PtoP]": "p2p_copy",
}
COMPUTE = [
    "nvjet_sm90_tst_64x16_64x16_4x1_v_bz_NNT",
    "void at::native::vectorized_elementwise_kernel<(int)8, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char *, (unsigned long)3>>(int, T2, T3)",
    "void sglang::memcpy_kernel<__nv_bfloat16>(...)",  # staging copy next to custom AR
    "void flashinfer::BatchDecodeWithPagedKVCacheKernel<...>(...)",
    "[CUDA memcpy DtoD]",
    "void cublasLt::splitKreduce_kernel<(int)32, (int)16, int, float, __nv_bfloat16>(...)",
    "fused_add_rmsnorm_kernel",
]


@pytest.mark.parametrize("name,family", list(COMM.items()))
def test_communication_kernels(name, family):
    assert classify([name]) == [family]


@pytest.mark.parametrize("name", COMPUTE)
def test_compute_kernels(name):
    assert classify([name]) == [None]


def test_every_pattern_is_exercised():
    hit = set()
    for name in COMM:
        for p in PATTERNS:
            if classify([name], [p])[0] == p.family:
                hit.add(p.regex)
    assert hit == {p.regex for p in PATTERNS}


def test_user_patterns(tmp_path):
    f = tmp_path / "mine.txt"
    f.write_text("# my kernels\nmy_ar=^my_allreduce\n")
    pats = load_patterns(["x_comm=xfer_kernel"], [f])
    assert classify(["my_allreduce_v2", "xfer_kernel<1>", "gemm"], pats) == ["my_ar", "x_comm", None]
    with pytest.raises(InputError):
        load_patterns(["nofamily"])
    with pytest.raises(InputError):
        load_patterns(["f=("])
