"""A blocking TensorFlow call that Ctrl-C still interrupts."""

import signal
import threading

import tensorflow as tf

from estimator_bf16.platform import interrupts


class RunInterruptiblyTest(tf.test.TestCase):
  """A long session.run waits in a worker thread, so Ctrl-C gets through."""

  def test_hands_back_the_value_and_the_error(self):
    done = threading.Event()
    self.assertEqual(interrupts.run_interruptibly(lambda: 7, done), 7)
    self.assertTrue(done.is_set())

    def fail():
      raise tf.errors.InvalidArgumentError(None, None, 'bad loop')

    with self.assertRaisesRegex(tf.errors.InvalidArgumentError, 'bad loop'):
      interrupts.run_interruptibly(fail, threading.Event())

  def test_ctrl_c_stops_the_wait_while_the_run_is_still_blocked(self):
    # A dequeue from an empty queue holds its session.run in C++ for good,
    # as a long XLA loop does; only closing the queue ends it.
    with tf.Graph().as_default():
      queue = tf.queue.FIFOQueue(1, tf.float32)
      dequeue = queue.dequeue()
      close = queue.close(cancel_pending_enqueues=True)
      session = tf.compat.v1.Session()
    done = threading.Event()
    main = threading.main_thread().ident
    timer = threading.Timer(
        0.5, lambda: signal.pthread_kill(main, signal.SIGINT))
    # Python's own Ctrl-C handler, whatever the test runner installed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
      timer.start()
      with self.assertRaises(KeyboardInterrupt):
        interrupts.run_interruptibly(lambda: session.run(dequeue), done)
      self.assertFalse(done.is_set())  # the run goes on in its thread
    finally:
      timer.cancel()
      signal.signal(signal.SIGINT, previous)
      session.run(close)  # ends the blocked dequeue
      self.assertTrue(done.wait(30))
      session.close()


if __name__ == '__main__':
  tf.test.main()
