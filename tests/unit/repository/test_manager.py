"""kserve_v2.repository.manager.ModelManager in-process: loads, reloads, failed loads, config overrides
kept and forgotten, unloads, ensembles and their composing models, readiness of the startup set, and
a load whose caller gives up, on real ONNX models in a temporary repository, with no server process.

Texts and states are Triton's (``model_lifecycle.cc`` and ``model_repository_manager.cc`` in
triton-inference-server/core)."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import replace
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
from onnx import TensorProto

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.models.version import ModelVersion
from kserve_v2.protocol.errors import InternalError, InvalidInput, NotFound
from kserve_v2.repository.loader import LoadResult
from kserve_v2.repository.manager import ModelManager, load_failure
from kserve_v2.repository.records import IndexEntry
from kserve_v2.settings.server import ModelLoadSettings
from tests.helpers import add_model, identity_model

T = TypeVar("T")
IDENTITY = ('max_batch_size: 0 input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }] '
            'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]')


def _ensemble(name: str, step: str) -> str:
    return (f'name: "{name}" platform: "ensemble" max_batch_size: 0 '
            'input [{ name: "IN" data_type: TYPE_FP32 dims: [-1] }] '
            'output [{ name: "OUT" data_type: TYPE_FP32 dims: [-1] }] '
            f'ensemble_scheduling {{ step [{{ model_name: "{step}" model_version: -1 '
            'input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } }] }')


async def _no_step(*args: object, **kwargs: object) -> None:
    raise AssertionError("no ensemble request runs in these tests")


def _repository(root: Path) -> Path:
    """``ident`` (two versions, both served), ``other``, ``broken`` (not ONNX) and the ensemble ``pair`` over ``ident``."""
    repository = root / "models"
    add_model(repository, "ident", identity_model(TensorProto.FLOAT, [-1]), IDENTITY + " version_policy { all {} }",
              versions=(1, 2))
    add_model(repository, "other", identity_model(TensorProto.FLOAT, [-1]), IDENTITY)
    add_model(repository, "broken", b"not onnx", IDENTITY)
    (repository / "pair" / "1").mkdir(parents=True)
    (repository / "pair" / "config.pbtxt").write_text(_ensemble("pair", "ident"))
    return repository


def _run(manager_test: Callable[[ModelManager, list[int]], Awaitable[T]], repository: Path,
         step_runner: bool = True) -> T:
    """Run ``manager_test`` on a manager of ``repository`` in one event loop (with the count of its
    change callbacks), then close the manager as the server's exit does."""
    changes = [0]

    def changed() -> None:
        changes[0] += 1

    async def body() -> T:
        manager = ModelManager([repository], gpus=0, on_change=changed)
        if step_runner:
            manager.step_runner = _no_step  # type: ignore[assignment]
        try:
            return await manager_test(manager, changes)
        finally:
            await manager.close()

    return asyncio.run(body())


def _watch_closes(models: list[ModelVersion]) -> list[ModelVersion]:
    """The list each of ``models`` adds itself to when it is closed (its sessions released)."""
    closed: list[ModelVersion] = []
    for model in models:
        def close(model: ModelVersion = model, original: Callable[[], None] = model.close) -> None:
            closed.append(model)
            original()

        model.close = close  # type: ignore[method-assign]
    return closed


async def _infer(model: ModelVersion) -> list[float]:
    """OUTPUT0 of the identity on [1, 2], through the version's scheduler."""
    execution, _, _ = await model.scheduler.submit({"INPUT0": np.array([1.0, 2.0], np.float32)}, ["OUTPUT0"], {}, 1)
    return [float(v) for v in execution.outputs[0]]


def test_a_load_makes_every_version_ready_and_the_index_shows_it(tmp_path: Path) -> None:
    repository = _repository(tmp_path)

    async def check(manager: ModelManager, changes: list[int]) -> None:
        assert manager.index(ready_only=False) == [IndexEntry(n) for n in ("broken", "ident", "other", "pair")]
        await manager.load("ident")
        assert changes[0] >= 2  # LOADING, then READY
        assert manager.index(ready_only=True) == [IndexEntry("ident", "1", "READY"), IndexEntry("ident", "2", "READY")]
        assert manager.resolve("ident", "").version == 2 and manager.resolve("ident", "1").version == 1
        assert manager.is_ready("ident", "1") and not manager.is_ready("other", "")
        with pytest.raises(NotFound, match="Request for unknown model: 'other' is not found"):
            manager.resolve("other", "")
        assert manager.stored_config("ident").max_batch_size == 0
        assert manager._locks == {}  # a lock lives only while a call holds it

    _run(check, repository)


def test_a_reload_swaps_versions_and_retires_the_old_ones_once_drained(tmp_path: Path) -> None:
    repository = _repository(tmp_path)

    async def check(manager: ModelManager, changes: list[int]) -> None:
        await manager.load("ident")
        old = manager.resolve("ident", "1")
        closed = _watch_closes(manager.ready_versions("ident"))
        old.hold()  # a request in flight on the old version
        (repository / "ident" / "config.pbtxt").write_text(IDENTITY + ' version_policy { specific { versions: [1] } }')
        await manager.load("ident")
        new = manager.resolve("ident", "1")
        assert new is not old and [e.state for e in manager.index(ready_only=False) if e.name == "ident"] == [
            "READY", "UNAVAILABLE"]
        assert manager.record("ident").versions[2].reason == "unloaded"  # dropped by the new policy
        await asyncio.sleep(0.05)
        assert old not in closed and await _infer(old) == [1.0, 2.0]  # still serving its request
        old.release()
        await asyncio.wait_for(asyncio.gather(*manager._background), 30)
        assert sorted(m.version for m in closed) == [1, 2]  # the old version 1, and version 2 that the policy drops
        assert old in closed and new not in closed and await _infer(new) == [1.0, 2.0]

    _run(check, repository)


def test_a_failed_load_is_tritons_text_and_a_failed_reload_keeps_what_serves(tmp_path: Path) -> None:
    repository = _repository(tmp_path)

    async def check(manager: ModelManager, changes: list[int]) -> None:
        with pytest.raises(InvalidInput, match=r"^load failed for model 'broken': version 1 is at UNAVAILABLE state: "):
            await manager.load("broken")
        [row] = [e for e in manager.index(ready_only=False) if e.name == "broken"]
        assert (row.version, row.state) == ("1", "UNAVAILABLE") and row.reason
        await manager.load("other")
        serving = manager.resolve("other", "1")
        bad = json.dumps({"input": [{"name": "NOPE", "data_type": "TYPE_FP32", "dims": [-1]}]})
        with pytest.raises(InvalidInput, match="load failed for model 'other'"):
            await manager.load_requested("other", {"config": pb.ModelRepositoryParameter(string_param=bad)})
        assert manager.resolve("other", "1") is serving and manager.is_ready("other", "1")

    _run(check, repository)


def test_names_and_parameters_that_cannot_load_are_refused_before_anything_changes(tmp_path: Path) -> None:
    repository = _repository(tmp_path)

    async def check(manager: ModelManager, changes: list[int]) -> None:
        with pytest.raises(InternalError, match="^failed to load 'absent', failed to poll from model repository$"):
            await manager.load("absent")
        with pytest.raises(InvalidInput):
            await manager.load("../ident")  # outside the repository
        with pytest.raises(InvalidInput, match="Unrecognized load parameter 'priority' with type 'int64'"):
            await manager.load_requested("ident", {"priority": pb.ModelRepositoryParameter(int64_param=1)})
        with pytest.raises(InternalError, match="failed to load 'ident', failed to poll from model repository"):
            await manager.load_requested("ident", {"config": pb.ModelRepositoryParameter(string_param="{not json")})
        assert not manager.knows("absent") and not manager.knows("ident") and changes == [0]

    _run(check, repository)


def test_a_config_override_is_kept_until_the_folder_changes_or_the_model_unloads(tmp_path: Path) -> None:
    repository = _repository(tmp_path)
    config_json = json.dumps({"max_batch_size": 0, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                              "parameters": {"source": {"string_value": "override"}}})
    override = {"config": pb.ModelRepositoryParameter(string_param=config_json)}

    def overridden(manager: ModelManager) -> bool:
        return "source" in manager.resolve("other", "1").config.parameters

    async def check(manager: ModelManager, changes: list[int]) -> None:
        await manager.load_requested("other", override)
        assert overridden(manager)
        await manager.load("other")  # no parameters: the override is kept
        assert overridden(manager)
        config = repository / "other" / "config.pbtxt"
        stamp = config.stat().st_mtime_ns + 2 * 10**9
        os.utime(config, ns=(stamp, stamp))  # a file of the folder changed: config.pbtxt again
        await manager.load("other")
        assert not overridden(manager)
        await manager.load_requested("other", override)
        await manager.unload("other")  # an unload forgets the override
        await manager.load("other")
        assert not overridden(manager)

    _run(check, repository)


def test_an_unload_ends_every_version_and_unknown_names_unload_quietly(tmp_path: Path) -> None:
    repository = _repository(tmp_path)

    async def check(manager: ModelManager, changes: list[int]) -> None:
        await manager.load_startup_models(["ident", "other"])
        assert manager.models_ready()
        models = manager.ready_versions("ident")
        closed = _watch_closes(models)
        await manager.unload("ident")
        assert sorted(m.version for m in closed) == [1, 2] and manager.ready_versions("ident") == []
        assert [(e.state, e.reason) for e in manager.index(ready_only=False) if e.name == "ident"] == [
            ("UNAVAILABLE", "unloaded"), ("UNAVAILABLE", "unloaded")]
        assert manager.models_ready()  # unloaded on purpose: readiness no longer waits for it
        await manager.unload("never_loaded")
        assert not manager.knows("never_loaded") and manager._locks == {}
        manager.forget("ident")
        assert not manager.knows("ident")

    _run(check, repository)


def test_the_startup_set_is_ready_only_when_each_of_its_models_is(tmp_path: Path) -> None:
    repository = _repository(tmp_path)

    async def check(manager: ModelManager, changes: list[int]) -> None:
        assert not manager.models_ready()  # poll mode: nothing asked for is not ready
        await manager.load_startup_models(["other", "broken"], at_once=2)  # a failure is logged, not raised
        assert manager.is_ready("other", "") and not manager.is_ready("broken", "")
        assert not manager.models_ready()
        await manager.unload("broken")  # unloaded on purpose: its failure no longer counts
        assert manager.models_ready()

    _run(check, repository)


def test_a_model_loaded_on_demand_counts_for_readiness_as_triton_counts_it(tmp_path: Path) -> None:
    repository = _repository(tmp_path)

    async def check(manager: ModelManager, changes: list[int]) -> None:
        await manager.load_startup_models(["other"])
        assert manager.models_ready()
        with pytest.raises(InvalidInput):
            await manager.load("broken")  # on demand, after the start: Triton's IsReady counts it all the same
        assert not manager.models_ready()
        await manager.load("ident")
        assert not manager.models_ready()  # still 'broken'
        await manager.unload("broken")
        assert manager.models_ready()

    _run(check, repository)


def test_an_ensemble_loads_its_steps_first_and_unloads_them_when_no_other_uses_them(tmp_path: Path) -> None:
    repository = _repository(tmp_path)
    (repository / "pair2" / "1").mkdir(parents=True)
    (repository / "pair2" / "config.pbtxt").write_text(_ensemble("pair2", "ident"))

    async def check(manager: ModelManager, changes: list[int]) -> None:
        await manager.load("pair")
        assert manager.is_ready("ident", "") and manager.is_ready("pair", "")
        assert manager.composing_models("pair") == {"ident"}
        assert not manager.resolve("pair", "").decoupled
        await manager.load("pair2")
        await manager.unload_with_composing("pair")
        assert manager.is_ready("ident", "")  # pair2 still runs it
        await manager.unload("ident")
        assert not manager.is_ready("pair2", "")  # an ensemble is ready only while its steps are
        await manager.unload_with_composing("pair2")
        assert not manager.knows("other")

    _run(check, repository)


def test_an_ensemble_that_cannot_run_is_a_failed_load_naming_why(tmp_path: Path) -> None:
    repository = _repository(tmp_path)
    (repository / "loop_a" / "1").mkdir(parents=True)
    (repository / "loop_a" / "config.pbtxt").write_text(_ensemble("loop_a", "loop_b"))
    (repository / "loop_b" / "1").mkdir(parents=True)
    (repository / "loop_b" / "config.pbtxt").write_text(_ensemble("loop_b", "loop_a"))
    (repository / "on_broken" / "1").mkdir(parents=True)
    (repository / "on_broken" / "config.pbtxt").write_text(_ensemble("on_broken", "broken"))

    async def check(manager: ModelManager, changes: list[int]) -> None:
        with pytest.raises(InvalidInput, match=r"circular dependency loop_a -> loop_b -> loop_a"):
            await manager.load("loop_a")
        with pytest.raises(InvalidInput, match="ensemble 'on_broken' depends on 'broken' which is not valid "
                                               r"\(step 0\): load failed for model 'broken'"):
            await manager.load("on_broken")
        assert not manager.is_ready("on_broken", "")

    _run(check, repository)

    async def no_runner(manager: ModelManager, changes: list[int]) -> None:
        with pytest.raises(InvalidInput, match="ensemble 'pair' cannot run: the server has no inference call"):
            await manager.load("pair")

    _run(no_runner, repository, step_runner=False)


def test_a_load_whose_caller_is_cancelled_still_ends(tmp_path: Path) -> None:
    repository = _repository(tmp_path)

    async def check(manager: ModelManager, changes: list[int]) -> None:
        caller = asyncio.ensure_future(manager.load("ident"))
        await asyncio.sleep(0)  # the load has started
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.wait_for(asyncio.gather(*manager._background), 60)
        assert manager.is_ready("ident", "1") and manager.is_ready("ident", "2")  # not left LOADING

    _run(check, repository)


def test_load_failure_is_tritons_text() -> None:
    failed = LoadResult()
    failed.failed = {2: "bad graph", 1: "no file"}
    assert load_failure("m", failed) == ("load failed for model 'm': version 1 is at UNAVAILABLE state: no file;"
                                         "version 2 is at UNAVAILABLE state: bad graph;\n")
    failed.error = "whole model broken"
    assert load_failure("m", failed) == "load failed for model 'm': whole model broken\n"


def test_the_stored_configuration_of_a_model_not_loaded_is_the_config_name_one(tmp_path: Path) -> None:
    """``--model-config-name``: ``configs/<name>.pbtxt`` is what the manager reads of a model never
    loaded (the text routes' lists, ModelConfig of a model not loaded), as a load reads it."""
    repository = _repository(tmp_path)
    (repository / "other" / "configs").mkdir()
    (repository / "other" / "configs" / "h100.pbtxt").write_text(IDENTITY.replace("max_batch_size: 0",
                                                                                   "max_batch_size: 0 version_policy { latest { num_versions: 2 } }"))

    async def check(manager: ModelManager, changes: list[int]) -> None:
        assert not manager.stored_config("other").version_policy.HasField("latest")  # config.pbtxt
        manager.host = replace(manager.host, model_load=ModelLoadSettings(config_name="h100"))
        manager._stored.clear()  # as a new server would start
        assert manager.stored_config("other").version_policy.latest.num_versions == 2
        assert manager.stored_config("ident").max_batch_size == 0  # no configs/h100.pbtxt: config.pbtxt

    _run(check, repository)
