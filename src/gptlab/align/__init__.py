"""Alignment, built on gptlab.train: fine-tuning (finetune/: SFT), preference optimisation (preference/: DPO) and RL
with rewards (rl/: GRPO, PPO, reward models, judges); what they share (start, launch, logprobs) sits here."""
