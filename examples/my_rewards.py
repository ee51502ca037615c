"""An example reward function for `gptlab grpo --reward "verifier, examples/my_rewards.py:brevity*0.1"`.

Called as TRL calls reward functions: keyword arguments only, one float (or None) per completion.
"""


def brevity(prompts, completions, **columns):
    """Shorter answers score higher: 1.0 for an empty completion, 0.0 from 400 characters on."""
    return [1.0 - min(len(text), 400) / 400 for text in completions]
