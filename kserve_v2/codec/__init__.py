"""The V2 inference messages' wire codec, with no protobuf objects on the request path.

- ``requests``: ``ModelInferRequest`` from the received bytes, tensor data left in place.
- ``responses``: ``ModelInferResponse`` and ``ModelStreamInferResponse`` to bytes, each output copied once.
- ``messages``: the messages as plain Python objects.
- ``contents``: typed tensor data (``InferTensorContents``) into numpy arrays.
- ``wire``: Protocol Buffers wire format primitives.
- ``generated``: between the codec's objects and the generated protobuf classes.
"""
