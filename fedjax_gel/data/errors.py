"""The one error a dataset raises for input that cannot be used (LEAF files, TFDS data, shipped
subsets): ``DataError``, whose message names the source and the problem on one line."""


class DataError(ValueError):
  """Raised for a data file, dict or dataset that cannot be used (a ``ValueError``).

  Args:
    message: names the source and the problem; kept on one line (line breaks, e.g. from a file
      name or a library's message, become spaces).
  """

  def __init__(self, message: str):
    super().__init__(' '.join(str(message).splitlines()))
