"""Test and benchmark models written in the styles users bring.

Each module is a legacy TPUEstimator model that knows nothing of
estimator_bf16, written the way its style's users write it:

* `bert_style`: raw `tf.compat.v1.get_variable` without a dtype, as
  google-research/bert's modeling code does (gather / one-hot embeddings,
  a float32 attention-mask adder, tf-slim or hand-written layer norm);
* `keras_style`: Keras layers (`Conv2D`, `BatchNormalization`, `Dense`,
  `LayerNormalization`) called inside a model_fn;
* `slim_style`: tf-slim layers, `batch_norm` included;
* `layers_style`: `tf.compat.v1.layers`.

`STYLES` maps a style name to its module; each module has
`model_fn_builder(...)` and `input_fn_builder(...)` (closures, as
google-research/bert's run_classifier builds them) and `NUM_CLASSES`.
"""

from estimator_bf16.models.styles import bert_style
from estimator_bf16.models.styles import keras_style
from estimator_bf16.models.styles import layers_style
from estimator_bf16.models.styles import slim_style

STYLES = {
    'bert_style': bert_style,
    'keras_style': keras_style,
    'slim_style': slim_style,
    'layers_style': layers_style,
}

__all__ = ['STYLES', 'bert_style', 'keras_style', 'layers_style',
           'slim_style']
