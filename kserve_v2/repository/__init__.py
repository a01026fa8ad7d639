"""The model repository: layout, configuration, and the model lifecycle."""
