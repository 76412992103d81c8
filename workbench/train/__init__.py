"""Shared fine-tuning for every mechanism: length-bucketed batches, the training loop with its
learning-rate schedule, evaluation (one submodel or the whole depth x width accuracy grid) and
checkpoints cached by their inputs. Mechanism packages bring only what is theirs (elastic: the
sandwich rule and the importance reordering; early exit: the exit ramps)."""
