"""A custom MLServer runtime that serves an ONNX model on ONNX Runtime (CPU), for benchmarks/compare.py.

It is the smallest honest runtime: MLServer's NumpyCodec decodes each V2 input, one
InferenceSession runs the graph, NumpyCodec encodes each output. `parameters.uri` in the model's
model-settings.json is the path of the .onnx file. Runs inside MLServer's own environment.
"""

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    async def load(self) -> bool:
        self._session = ort.InferenceSession(self.settings.parameters.uri, providers=["CPUExecutionProvider"])
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {tensor.name: NumpyCodec.decode_input(tensor) for tensor in payload.inputs}
        arrays = self._session.run(self._outputs, feeds)
        return InferenceResponse(model_name=self.name, outputs=[
            NumpyCodec.encode_output(name, array) for name, array in zip(self._outputs, arrays, strict=True)])
