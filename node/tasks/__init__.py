"""Task sources. Every task is addressed by a TaskRef from which question and answer are rebuilt."""
