"""The README's Python example runs as written and trains the model."""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / 'README.md'


def python_blocks():
  return re.findall(r'```python\n(.*?)```', README.read_text(), re.S)


def run_block(code):
  scope = {}
  exec(compile(code, 'README.md', 'exec'), scope)   # pylint: disable=exec-used
  return scope


def test_readme_engine_example_trains():
  scope = run_block(python_blocks()[0])
  assert scope['metrics'].grad_computations > 0
  assert 0 < float(scope['metrics'].train_loss) < 1.0   # from ln(5) = 1.61 at the start


def test_readme_guessed_updates_example_fits_better_than_without_guesses():
  code = python_blocks()[1]
  scope = run_block(code)
  without = run_block(code.replace('opt.guess(state, w, 2)', 'opt.guess(state, w, 0)'))
  loss = scope['loss']
  assert float(loss(scope['w'])) < 0.5 * float(loss(without['w'])) < float(loss(0 * scope['w']))


def test_readme_quick_start_names_the_shipped_files():
  text = README.read_text()
  assert 'pip install -e . && python launch/run.py --flagfile=launch/configs/quickstart.flags' in text
  assert "pip install -e '.[test]' && pytest" in text
  assert (README.parent / 'launch/configs/quickstart.flags').exists()


def test_readme_stateful_example_keeps_a_row_per_client():
  """The SCAFFOLD block continues the engine example's session (its data, model and keys)."""
  scope = run_block(python_blocks()[0].replace('range(100)', 'range(1)'))
  exec(compile(python_blocks()[2], 'README.md', 'exec'), scope)   # pylint: disable=exec-used
  rows = scope['state'].clients['Dense_0']['kernel']
  touched = int((abs(rows).sum(axis=(1, 2)) > 0).sum())
  assert 0 < touched <= 60   # the clients of three rounds of 20 wrote their c_i
  assert int(scope['metrics'].num_clients) == 20
