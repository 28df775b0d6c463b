"""What a screen is: its config (ScreenConfig, validated once at the edge), the treatments, the designs of
each phase, presets and the pre-registered predictions' rules. Every later wing reads a screen through it."""
