"""Weight-space merges as arms: model soups and dose lines."""
