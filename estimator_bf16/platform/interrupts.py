"""Blocking TensorFlow calls that Ctrl-C can still interrupt.

`run_interruptibly` runs a call (a long `session.run`) in a worker thread
while the main thread waits in short, interruptible waits.
"""

import threading

# How often the main thread looks up from a call running in its worker
# thread: a Ctrl-C is seen within this many seconds.
POLL_SECONDS = 0.1


def run_interruptibly(run, done):
  """Returns `run()`, called in a worker thread so that Ctrl-C stops at once.

  A `session.run` holds its thread in C++ for as long as the step runs;
  XLA compiles and runs a whole loop in one, for minutes on a large model
  (a float32 ResNet-18 at 224 px, batch 64: Ctrl-C had not stopped `check
  --xla --xla_steps=2` five minutes later). Python raises KeyboardInterrupt
  only when the main thread is back in Python, so the main thread waits
  here in short waits instead, which a signal interrupts. The worker is a
  daemon thread, so the process can exit while the run goes on.

  Args:
    run: the callable, e.g. a `session.run` of the loop.
    done: a `threading.Event`, set when `run` has returned or raised; a
      caller that sees it unset after a KeyboardInterrupt knows `run` is
      still going (an event, not `Thread.is_alive`: a join interrupted by
      Ctrl-C marks the thread stopped although it still runs, Python 3.11).

  Returns:
    What `run` returned; what it raised is raised here.
  """
  outcome = {}

  def work():
    try:
      outcome['value'] = run()
    except BaseException as e:  # pylint: disable=broad-except
      outcome['error'] = e
    finally:
      done.set()

  threading.Thread(target=work, name='interruptible_run', daemon=True).start()
  while not done.wait(POLL_SECONDS):
    pass
  if 'error' in outcome:
    raise outcome['error']
  return outcome['value']
