"""The original's device and core-count queries (tile_kernels' top level re-exports them; names
checked by test_api_surface.py): what they answer on a host without an NPU, and the Ascend ones
as its notes give them."""

import pytest
import torch

import tilebake
from tilebake import config


def test_the_backend_switch_reads_the_ascend_device_node(monkeypatch):
    config.is_ascend.cache_clear()
    monkeypatch.setattr(config.os.path, "exists", lambda path: path == "/dev/davinci_manager")
    try:
        assert tilebake.is_ascend() and tilebake.get_device() == "npu"
    finally:
        config.is_ascend.cache_clear()
    monkeypatch.undo()
    assert tilebake.get_device() == ("npu" if config.os.path.exists("/dev/davinci_manager") else "cuda")


def test_core_counts_follow_the_sm_count(monkeypatch):
    monkeypatch.setattr(config, "get_device_num_sms", lambda: 132)
    assert tilebake.get_num_ai_cores() == tilebake.get_num_cube_cores() == tilebake.get_num_sms() == 132
    assert tilebake.get_num_vec_cores() == 264


def test_unified_buffer_budget():
    assert tilebake.get_max_ub_per_vector_core() == 216 * 1024
    assert tilebake.get_max_ub_per_vector_core(use_simt=False) == 248 * 1024


@pytest.mark.gpu
def test_shared_memory_per_sm_is_the_devices():
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert tilebake.get_max_smem_per_sm() == props.shared_memory_per_multiprocessor > 0
