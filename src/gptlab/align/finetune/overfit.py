"""Fine-tuning's two warnings about memorising a small set of conversations.

Before training: how many times the run will see its training conversations (epochs), estimated from the
rendered length of up to SAMPLED conversations; past MAX_EPOCHS one line says so and what to do. During
training: at an evaluation where val loss has risen above its best while the train loss fell far below it
(below GAP times val loss), one line says the model is learning the training conversations by heart.
Thresholds: a few epochs is usual for SFT (InstructGPT trained 16 on purpose, with val loss rising); a small
model on a few dozen conversations reaches train loss 0.02 against val 8, which is what these lines are for.
Not here: the training loop (gptlab.train), the data (gptlab.chat.data).
"""

from __future__ import annotations

import math

MAX_EPOCHS = 4.0  # more passes over the training conversations than this: warned before training
SAMPLED = 512  # conversations rendered to estimate the tokens of an epoch
RISE = 1.05  # val loss this far above its best counts as rising
GAP = 0.5  # ... while the train loss is below this fraction of the val loss


def rows_per_epoch(mixture, chat, seq_len: int, rows: str) -> float:
    """Rows of seq_len tokens one pass over the mixture fills: a row per conversation when padded; packed,
    their total rendered length (each cut to a row) over the row length, from an even sample of them."""
    count = len(mixture)
    if rows == "pad":
        return float(count)
    keys = [mixture.order(0)[round(i * (count - 1) / max(1, min(count, SAMPLED) - 1))] for i in range(min(count, SAMPLED))]
    lengths = [min(len(chat.render(mixture.get(int(part), int(index))).ids), seq_len + 1) for part, index in keys]
    return count * (sum(lengths) / len(lengths)) / (seq_len + 1)


def epochs_warning(config, mixture, chat, flags: str = "") -> str:
    """One line when the run will pass over its training conversations more than MAX_EPOCHS times; "" otherwise.
    `flags` is the prefix the command's flags carry (gptlab run: "sft.")."""
    if config.max_steps >= 10**8:  # trained by time: the number of steps is not known
        return ""
    epochs = config.max_steps * (config.batch_tokens / config.seq_len) / max(rows_per_epoch(mixture, chat, config.seq_len, config.rows), 1e-9)
    if epochs <= MAX_EPOCHS:
        return ""
    steps = max(1, math.floor(config.max_steps * MAX_EPOCHS / epochs))
    return (f"warning: {config.max_steps:,} steps of {config.batch_tokens:,} tokens pass over the {len(mixture):,} training "
            f"conversations about {epochs:.0f} times (epochs); past {MAX_EPOCHS:g} a model learns them by heart and its val "
            f"loss rises: add conversations, or train about {steps:,} steps (--{flags}max-steps {steps})")


def overfitting_warning(train_losses: list[float], val_loss: float, best_before: float | None, step: int) -> str:
    """One line when val loss rose above its earlier best while the recent train loss fell far below it; "" otherwise."""
    if best_before is None or not train_losses or not math.isfinite(val_loss):
        return ""
    recent = train_losses[-min(len(train_losses), 10):]
    train = sum(recent) / len(recent)
    if val_loss <= best_before * RISE or train >= GAP * val_loss:
        return ""
    return (f"warning: at step {step} val loss {val_loss:.3f} rose above its best {best_before:.3f} while the train loss fell "
            f"to {train:.3f}: the model is learning the training conversations by heart (overfitting); the checkpoint "
            "with the best val loss is kept; use fewer steps or more conversations")
