"""A local run of TransferQueue 0.1.11's controller (a Ray actor, on the CPU) with seqbal's
sampler: producers put GRPO rollouts (with ``total_lengths`` in their custom_meta) while two
consumers, data-parallel ranks 0 and 1, read batches; halfway the system is checkpointed, shut
down, started again with a fresh sampler and restored. Run by tests/test_transfer_queue.py in a
subprocess under a hard deadline; prints one JSON line with what every consumer read, and
leaves the controller's final checkpoint (its sampler's plans and pending groups) in OUT_DIR/final.

    python -m tests.transfer_queue_workers OUT_DIR
"""

from __future__ import annotations

import json
import random
import sys
import threading
import warnings

CAP = 2048
GROUP = 4
DP = 2
BATCH = 8  # per rank: a batch is 16 samples, 4 groups
ROUNDS = 6


def start(sampler) -> None:
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, namespace="seqbal-tq-test", log_to_driver=False)
    config = OmegaConf.create(
        {"controller": {"sampler": sampler, "polling_mode": True}, "backend": {"SimpleStorage": {"num_data_storage_units": 1}}},
        flags={"allow_objects": True},
    )
    tq.init(config)


def produce(client, rng: random.Random, lengths: dict[int, int], groups: int) -> None:
    """Put ``groups`` GRPO groups, each sample's tokens as its ``input_ids`` row, its length in
    its custom_meta, as a rollout worker would."""
    import torch
    from tensordict import TensorDict

    sizes = [rng.randint(16, CAP // GROUP) for _ in range(groups * GROUP)]
    data = TensorDict({"input_ids": torch.tensor([[n] for n in sizes])}, batch_size=len(sizes))
    meta = client.put(data=data, partition_id="train")
    meta.update_custom_meta([{"total_lengths": n} for n in sizes])
    client.set_custom_meta(meta)
    lengths.update(zip(meta.global_indexes, sizes))


def consume(client, batch_index: int, reads: dict) -> None:
    """Both ranks, each in its own thread, ask for their share of ``batch_index``."""
    def one(rank: int) -> None:
        meta = client.get_meta(data_fields=["input_ids"], batch_size=BATCH, partition_id="train", task_name="actor",
                               sampling_config={"dp_rank": rank, "batch_index": batch_index})
        reads[(batch_index, rank)] = list(meta.global_indexes)

    threads = [threading.Thread(target=one, args=(rank,)) for rank in range(DP)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


def main(out_dir: str) -> None:
    warnings.filterwarnings("ignore")
    import ray
    import transfer_queue as tq

    from seqbal.integrations.transfer_queue import SeqbalSampler

    rng = random.Random(0)
    lengths: dict[int, int] = {}
    reads: dict = {}
    sampler = SeqbalSampler(n_samples_per_prompt=GROUP, dp_size=DP, max_token_len=CAP)
    start(sampler)
    client = tq.get_client()
    for batch_index in range(ROUNDS):
        if batch_index == ROUNDS // 2:  # checkpoint, shut everything down, start again, restore
            tq.save_checkpoint(f"{out_dir}/checkpoint")
            tq.close()
            ray.shutdown()
            start(SeqbalSampler(n_samples_per_prompt=GROUP, dp_size=DP, max_token_len=CAP))
            tq.load_checkpoint(f"{out_dir}/checkpoint")
            client = tq.get_client()
        produce(client, rng, lengths, rng.randint(2, 6))
        consume(client, batch_index, reads)
    # The controller's state, its sampler's included (the micro-batches it planned, what is pending).
    tq.save_checkpoint(f"{out_dir}/final")
    print(json.dumps({
        "lengths": {str(k): v for k, v in lengths.items()},
        "reads": {f"{b}:{r}": v for (b, r), v in reads.items()},
    }))
    tq.close()
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
