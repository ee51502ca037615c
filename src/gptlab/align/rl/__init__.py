"""RL with rewards: rollouts, GRPO and PPO, reward functions, reward models, verifiers and LM judges as rewards, best-of-n.

GRPO (grpo*.py, learnable.py) and PPO (ppo*.py, prompts.py, scalar.py) sample from the current weights (rollout.py)
and learn from rewards (rewards.py; rm.py and rm_reward.py: reward models; judge_reward.py: an LM judge).
"""
