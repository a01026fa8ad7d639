"""Front ends that transcode HTTP onto the same InferenceService calls the gRPC servicer makes."""
