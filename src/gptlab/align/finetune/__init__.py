"""Fine-tuning: supervised fine-tuning (SFT) of a base model on conversations in the chat format, on the Trainer."""
