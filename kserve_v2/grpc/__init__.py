"""The gRPC front end: status mapping, servicer, server construction."""
