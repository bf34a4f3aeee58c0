"""Packaging for estimator_bf16: the library, its reference models and programs.

Only the `estimator_bf16` package is installed (so no top-level name collides
with a user's own `models` or `scripts`); the reference models, the training
CLI and the TPU submission program live under it. `benchmarks/`, `scripts/`
and `tests/` are for working in the repository, and `models/` holds example
user programs to run with `python -m estimator_bf16 run`; none of them is
installed.
"""

import setuptools

setuptools.setup(
    name='estimator_bf16',
    version='0.1.0',
    description=('Train unmodified TPUEstimator model_fn/input_fn code in '
                 'bfloat16, with a graph audit that fails fast on a CPU.'),
    long_description=open('README.md').read(),
    long_description_content_type='text/markdown',
    packages=setuptools.find_packages(include=['estimator_bf16',
                                               'estimator_bf16.*']),
    python_requires='>=3.9',
    install_requires=[
        # 2.15 is the last release with tf.estimator (the real TPUEstimator,
        # needed on Cloud TPUs); on 2.16+ estimator_bf16.compat stands in on
        # the CPU/GPU. Pin 2.15 (requirements.txt) for TPU work.
        'tensorflow>=2.15',
        'tf-slim>=1.1,<2',
        'absl-py>=1.0',
        'six>=1.15',
        'tqdm>=4.60',  # progress bars of the training commands
    ],
    extras_require={
        'demo': ['scikit-learn>=1.3', 'matplotlib>=3.7'],
        'tpu': ['PyYAML>=6'],
        # tf.compat.v1.layers and tf.summary on TensorFlow 2.16+.
        'tf-latest': ['tf-keras', 'tensorboard'],
        'test': ['pytest>=7', 'pytest-xdist>=3', 'hypothesis>=6',
                 'scikit-learn>=1.3', 'matplotlib>=3.7', 'PyYAML>=6'],
    },
    entry_points={
        'console_scripts': [
            'estimator-bf16=estimator_bf16.apps.cli:main',
            'estimator-bf16-train=estimator_bf16.apps.train_cli:run',
            'tpu-submit=estimator_bf16.apps.tpu_submit.main:main',
        ],
    },
)
