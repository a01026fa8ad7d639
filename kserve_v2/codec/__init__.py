"""The V2 inference messages' wire codec: ``ModelInferRequest`` decoded from the received bytes with
its tensor data left in place, ``ModelInferResponse`` and ``ModelStreamInferResponse`` encoded with
each output copied once (see ``requests``, ``responses``, ``messages``)."""
