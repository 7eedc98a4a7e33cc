"""Models in and out of other toolkits: transformers' Marian (OPUS-MT) checkpoints imported
and exported, our weights exported to CTranslate2."""
