"""A tritonclient gRPC stream read in order, for the server tests of decoupled models (it imports tritonclient:
never import it from a unit test, whose process holds the server's own protobuf modules)."""

from __future__ import annotations

import queue

import tritonclient.grpc as grpcclient

from helpers import Server

Answer = tuple[str, int | None, bool, str | None]


class StreamReader:
    """A tritonclient stream whose results are read in the order they come; each answer is (request id, the
    INT32 output ``output``'s first value or None, ``triton_final_response``, error message or None)."""

    def __init__(self, server: Server, output: str = "OUT") -> None:
        self.client = grpcclient.InferenceServerClient(server.url)
        self.output = output
        self.results: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def next(self) -> Answer:
        """The next response (waits up to 30 s)."""
        result, error = self.results.get(timeout=30)
        if error is not None:
            return "", None, True, error.message()
        response = result.get_response()
        out = result.as_numpy(self.output)
        return response.id, None if out is None else int(out[0]), response.parameters["triton_final_response"].bool_param, None

    def until_final(self) -> list[Answer]:
        """The responses up to the one that carries the final flag."""
        answers = [self.next()]
        while not answers[-1][2]:
            answers.append(self.next())
        return answers

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()
