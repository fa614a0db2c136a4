"""Rewards: for now the environment's own reward travels in every transition record; human
labels arrive as the record's `label` column. Learned success classifiers join here."""
