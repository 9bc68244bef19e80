"""Pod groups: gangs of pods placed all together or not at all."""
