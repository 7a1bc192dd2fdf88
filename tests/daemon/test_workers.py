"""Several workers per daemon: devices, member ids, threads, GPU counting."""

from __future__ import annotations

from peerd.core.workers import member_ids, split_threads, worker_devices
from peerd.daemon.devices import local_gpus


def test_devices_auto_is_every_gpu_or_one_auto_worker():
    assert worker_devices((), 2) == ("cuda:0", "cuda:1")
    assert worker_devices((), 0) == ("auto",)
    assert worker_devices(("cpu", "cpu"), 4) == ("cpu", "cpu")
    assert worker_devices(("auto",), 4) == ("auto",)


def test_a_single_worker_keeps_the_daemon_id():
    assert member_ids("box-1", 1) == ["box-1"]
    assert member_ids("box-1", 3) == ["box-1.0", "box-1.1", "box-1.2"]


def test_threads_are_split_and_never_zero():
    assert split_threads(8, 2) == 4
    assert split_threads(5, 2) == 2
    assert split_threads(1, 4) == 1


def test_gpus_are_counted_from_the_driver_or_cuda_visible_devices(tmp_path):
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (tmp_path / bus).mkdir()
    assert local_gpus({}, tmp_path) == 2
    assert local_gpus({"CUDA_VISIBLE_DEVICES": "1"}, tmp_path) == 1
    assert local_gpus({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) == 0
    assert local_gpus({"CUDA_VISIBLE_DEVICES": "0,-1,1"}, tmp_path) == 1
    assert local_gpus({}, tmp_path / "missing") == 0
