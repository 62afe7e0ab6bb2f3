"""Training: the LightningModule (wiring), its step strategies, callbacks, optimizer and the
LightningCLI of ``fit`` / ``validate`` / ``test``."""
