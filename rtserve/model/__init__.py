"""The model: the demo's data and training, packaging any classifier, reading an archive's metadata."""
