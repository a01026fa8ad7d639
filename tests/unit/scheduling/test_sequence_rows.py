"""The sequence batcher's row composition (kserve_v2.scheduling.sequence_rows), without an event loop: request
parameters, which sequences an execution takes, their rows, and what each row is fed (Triton's
sequence batcher rules)."""

from __future__ import annotations

import numpy as np
import pytest

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.protocol.datatypes import BY_V2
from kserve_v2.protocol.errors import InternalError, InvalidInput
from kserve_v2.scheduling.sequence_config import CORRID, END, READY, START, Control, ImplicitState, SequenceSettings
from kserve_v2.scheduling.sequence_rows import (Head, choose, layout, padding_feeds, row_feeds, sequence_parameters,
                                     state_rows)

INT32, UINT64, BYTES = BY_V2["INT32"], BY_V2["UINT64"], BY_V2["BYTES"]


def flag(name: str, kind: mc.ModelSequenceBatching.Control.Kind) -> Control:
    return Control(name, kind, INT32, np.array(0, np.int32), np.array(1, np.int32))


def settings(oldest: bool = False, batched: bool = True, max_batch: int = 4, preferred: tuple[int, ...] = (),
             delay_ns: int = 0, corrid: Control | None = None, states: tuple[ImplicitState, ...] = ()
             ) -> SequenceSettings:
    flags = (flag("START", START), flag("END", END), flag("READY", READY))
    return SequenceSettings("m", batched, max_batch, oldest, max_batch, preferred, delay_ns, 10**9, flags, corrid,
                            states)


def test_parameters_read_the_id_and_flags_and_leave_the_rest() -> None:
    corrid, start, end, rest = sequence_parameters(settings(), {"sequence_id": 7, "sequence_start": True, "x": "y"})
    assert (corrid, start, end, rest) == (7, True, False, {"x": "y"})
    assert sequence_parameters(settings(), {"sequence_id": -1})[0] == 2**64 - 1  # an int64 carries a uint64 id


@pytest.mark.parametrize(("parameters", "message"), [
    ({}, "must specify a non-zero or non-empty correlation ID"),
    ({"sequence_id": ""}, "must specify a non-zero or non-empty correlation ID"),
    ({"sequence_id": True}, "must be an integer or a string"),
    ({"sequence_id": 1.5}, "must be an integer or a string"),
])
def test_parameters_refuse_missing_or_malformed_ids(parameters: dict, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        sequence_parameters(settings(), parameters)


def test_parameters_refuse_an_id_of_the_other_kind_than_corrid() -> None:
    numeric = settings(corrid=Control("CORRID", CORRID, UINT64, np.zeros((), np.uint64), np.zeros((), np.uint64)))
    with pytest.raises(InvalidInput, match="data-type is 'BYTES', but model 'm' expects 'UINT64'"):
        sequence_parameters(numeric, {"sequence_id": "abc"})
    text = settings(corrid=Control("CORRID", CORRID, BYTES, np.zeros((), object), np.zeros((), object)))
    with pytest.raises(InvalidInput, match="data-type is 'UINT64', but model 'm' expects 'BYTES'"):
        sequence_parameters(text, {"sequence_id": 3})


def test_direct_takes_the_oldest_key_and_goes_once_every_occupied_slot_has_a_request() -> None:
    heads = [Head("a", 30), Head("b", 10), Head("a", 20)]
    # the oldest request's key is "b": only that sequence; three slots are occupied, so it waits the delay
    assert choose(heads, settings(delay_ns=100), occupied=3, now_ns=50) == ([1], 60)
    assert choose(heads, settings(delay_ns=100), occupied=3, now_ns=110) == ([1], 0)  # the delay is over
    same = [Head("a", 30), Head("a", 10), Head("a", 20)]
    assert choose(same, settings(delay_ns=100), occupied=3, now_ns=50) == ([1, 2, 0], 0)  # oldest first


def test_oldest_goes_at_a_preferred_size_or_the_most_rows() -> None:
    heads = [Head("a", t) for t in (1, 2, 3)]
    preferred = settings(oldest=True, max_batch=4, preferred=(2,), delay_ns=10**6)
    assert choose(heads, preferred, occupied=3, now_ns=5) == ([0, 1], 0)  # cut to the preferred size
    waiting = settings(oldest=True, max_batch=4, delay_ns=100)
    assert choose(heads, waiting, occupied=3, now_ns=5) == ([0, 1, 2], 96)  # can still grow: waits
    full = settings(oldest=True, max_batch=2, delay_ns=100)
    assert choose(heads, full, occupied=3, now_ns=5) == ([0, 1], 0)  # max_batch rows


def test_direct_rows_follow_the_slots_with_padding_between() -> None:
    assert layout([2, 0], settings(), highest=3) == [1, None, 0, None]
    assert layout([2, 0], settings(oldest=True), highest=3) == [0, 1]
    assert layout([0], settings(batched=False), highest=0) == [0]


def test_a_row_gets_its_controls_and_state_with_the_batch_dim() -> None:
    state = ImplicitState("STATE_IN", "STATE_OUT", INT32, np.zeros(2, np.int32))
    corrid = Control("CORRID", CORRID, UINT64, np.zeros((), np.uint64), np.zeros((), np.uint64))
    batched = settings(corrid=corrid, states=(state,))
    feeds = {"INPUT": np.array([[5]], np.int32)}
    row = row_feeds(batched, feeds, True, False, True, 9, [np.array([3, 4], np.int32)])
    assert set(feeds) == {"INPUT"}  # the request's own feeds are not changed
    assert [row[n].tolist() for n in ("START", "END", "READY", "CORRID")] == [[[1]], [[0]], [[1]], [[9]]]
    assert row["STATE_IN"].tolist() == [[3, 4]] and row["INPUT"] is feeds["INPUT"]
    padding = padding_feeds(batched, {"INPUT": np.array([[5]], np.int32), "TEXT": np.array([[b"x"]], object)})
    assert padding["INPUT"].tolist() == [[0]] and padding["TEXT"].tolist() == [[b""]]
    assert [padding[n].tolist() for n in ("START", "READY", "CORRID")] == [[[0]], [[0]], [[0]]]
    assert padding["STATE_IN"].tolist() == [[0, 0]]  # the initial state
    unbatched = row_feeds(settings(batched=False), {}, False, True, True, 1, [])
    assert unbatched["END"].shape == (1,)


def test_state_rows_keep_a_copy_of_the_row_and_check_its_shape() -> None:
    state = ImplicitState("STATE_IN", "STATE_OUT", INT32, np.zeros(2, np.int32))
    output = np.array([[1, 2]], np.int32)
    [kept] = state_rows(settings(states=(state,)), [output])
    output[0, 0] = 9
    assert kept.tolist() == [1, 2]  # not a view of the batch's buffer
    with pytest.raises(InternalError, match=r"state output 'STATE_OUT' has shape \[3\], but the state's dims are \[2\]"):
        state_rows(settings(states=(state,)), [np.zeros((1, 3), np.int32)])
