"""The built-in datasets' specs, one module per kind (``synthetic``, ``leaf``, ``tfds``); their
loaders import the data modules they read when called."""
