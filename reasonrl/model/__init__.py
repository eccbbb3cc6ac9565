"""The model and the kernels every forward runs: loading (`load`: local folders, the embedded
default, Hub ids, the tiny random model), `model.precision` (`precision`), LoRA (`lora`), FSDP2
sharding (`sharding`, `shards`), the micro-batches and their forwards (`forward`, `head`,
`budget`, `grad_checkpointing`), and the run's model loaded once per process (`colocate`).
Nothing here trains or serves a role: `reasonrl.learn` trains, `reasonrl.workers` are the roles."""
