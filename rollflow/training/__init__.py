"""The trainer: decoupled PPO / GRPO on committed trajectory shards.

Pure math lives in small modules (``advantages``, ``losses``, ``kl``, ``microbatch``, ``logprobs``);
``batching`` turns trajectory groups into padded tensors; ``actor`` runs the forward/backward passes;
``trainer`` is the loop (data -> step -> publish -> resume point); ``run`` is the CLI for torchrun.

Nothing is imported here eagerly, so ``import rollflow.training`` stays cheap; import the module you need.
"""
