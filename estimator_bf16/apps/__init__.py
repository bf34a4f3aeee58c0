"""The command-line programs and the training application behind them."""
