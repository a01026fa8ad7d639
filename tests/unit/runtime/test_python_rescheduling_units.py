"""A python model's request release flags (Triton's python_backend README, "Request Rescheduling"):
what ``set_release_flags`` records, the check of what execute returns for a rescheduled request
(Triton's ``pb_stub.cc`` text), and the free-instance queue that keeps a sequence on its instance."""

from __future__ import annotations

import threading
import time

import pytest

from kserve_v2.runtime.python import pb_utils
from kserve_v2.runtime.python.executing import check_returned
from kserve_v2.runtime.python.model import _Free
from kserve_v2.runtime.python.tensors import InferenceResponse, TritonModelException


def test_release_flags_mark_a_request_rescheduled() -> None:
    request = pb_utils.InferenceRequest("id")
    assert not pb_utils.rescheduled(request)
    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    assert pb_utils.rescheduled(request)
    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL)
    assert not pb_utils.rescheduled(request)


def test_a_rescheduled_request_must_get_none_from_execute() -> None:
    check_returned([None, InferenceResponse([])], [True, False])
    with pytest.raises(TritonModelException) as raised:
        check_returned([InferenceResponse([])], [True])
    assert str(raised.value) == ("Expected a None object in the execute function return list for reschduled request, "
                                 "found type 'InferenceResponse'.")


def test_a_bound_execution_waits_for_its_own_instance() -> None:
    free = _Free()
    first, second = (object(), "m_0"), (object(), "m_1")
    free.put(first)
    free.put(second)
    assert free.get(1) is second  # not the one free longest
    taken: list[tuple[object, str]] = []
    waiter = threading.Thread(target=lambda: taken.append(free.get(1)))
    waiter.start()
    time.sleep(0.05)
    assert not taken  # instance 1 is busy; instance 0 is free but not the one bound
    free.put((second[0], second[1]))  # given back as a new tuple, as PythonModel.run does
    waiter.join(5)
    assert taken and taken[0][0] is second[0]
    free.put(taken[0])
    assert free.get() is first and free.get(3)[0] is second[0]  # an index past the end wraps around
