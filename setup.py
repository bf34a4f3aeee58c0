"""Packaging for estimator_bf16 (library), models (reference models, CLI)."""

import setuptools

setuptools.setup(
    name='estimator_bf16',
    version='0.1.0',
    description=('Train unmodified TPUEstimator model_fn/input_fn code in '
                 'bfloat16, with a graph audit that fails fast on a CPU.'),
    long_description=open('README.md').read(),
    long_description_content_type='text/markdown',
    packages=setuptools.find_packages(include=['estimator_bf16',
                                               'estimator_bf16.*', 'models',
                                               'models.*', 'scripts', 'scripts.*']),
    python_requires='>=3.9,<3.12',
    install_requires=[
        # tf.estimator (and so TPUEstimator) was removed in TensorFlow 2.16.
        'tensorflow>=2.15,<2.16',
        'tf-slim>=1.1,<2',
        'absl-py>=1.0',
        'six>=1.15',
        'numpy<2',
    ],
    extras_require={
        'demo': ['scikit-learn>=1.3', 'matplotlib>=3.7'],
        'tpu': ['PyYAML>=6'],
        'test': ['pytest>=7', 'pytest-xdist>=3', 'hypothesis>=6',
                 'scikit-learn>=1.3', 'matplotlib>=3.7', 'PyYAML>=6'],
    },
    entry_points={
        'console_scripts': [
            'estimator-bf16-train=models.train:run',
            'tpu-submit=scripts.tpu_submit:main',
        ],
    },
)
