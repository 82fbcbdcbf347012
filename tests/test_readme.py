"""The README's Python example runs as written and trains the model."""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / 'README.md'


def test_readme_python_example_runs():
  blocks = re.findall(r'```python\n(.*?)```', README.read_text(), re.S)
  assert blocks, 'README has no python example'
  scope = {}
  exec(compile(blocks[0], 'README.md', 'exec'), scope)   # pylint: disable=exec-used
  assert scope['metrics'].grad_computations > 0
  assert 0 < float(scope['metrics'].train_loss) < 1.0   # from ln(5) = 1.61 at the start


def test_readme_quick_start_names_the_shipped_files():
  text = README.read_text()
  assert 'pip install -e . && python launch/run.py --flagfile=launch/configs/quickstart.flags' in text
  assert "pip install -e '.[test]' && pytest" in text
  assert (README.parent / 'launch/configs/quickstart.flags').exists()
