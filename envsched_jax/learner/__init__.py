"""The learner: policy models, the training objectives (the paper's GRPO and masked SFT), the
optimizer and its schedule, and the trainer that applies them to batches of token sequences.
Import the submodules directly (``envsched_jax.learner.objectives``, ``.optim``, ``.trainer``, ...);
this package imports nothing so that loading one part never pulls in the others.
"""
