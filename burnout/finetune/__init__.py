"""Fine-tuning stage: a pretrained model taught to chat. Conversations and preference pairs read from every
common layout, tokenized into prepared folders, and trained by the recipes the Trainer runs like pretraining:
SFT (full or LoRA) and DPO; LoRA adapters saved beside the run and merged into a plain checkpoint."""
