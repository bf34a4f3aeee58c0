"""What this TensorFlow and this machine are, and scoped changes to TensorFlow."""
