"""Learning, written once for every trainable role: the `Learner` (epochs x mini-batches x
micro-batches, clipping, the optimizer step, the skip rule, optimizer state) and the LR
schedules (`schedules`, the LR_SCHEDULES registry). The policy and the critic train with it."""
