"""The role workers the role table (`reasonrl.placement.roles`) builds, one module each: the
policy (`policy`, and its data-parallel FSDP2 ranks in `ranks`), the critic (`critic`), and the
frozen models (`frozen`: the reference, served within the policy's worker; `teacher`; the judge,
`judge`). Each has its `from_config`; placement decides where it runs."""
