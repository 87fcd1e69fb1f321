"""Fine-tuning tasks: GLUE, SQuAD v1.1/v2.0, CoNLL-2003 NER, SWAG (readers, features, decoding,
metrics)."""
