"""A Flower app (ClientApp and ServerApp) whose updates go through SPGC's two servers."""
