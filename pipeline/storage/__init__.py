"""Azure Storage access: every name bagpipe gives to something in it (``names``), the clients
(``clients``), lean table transactions, verified transfers, packing and the blob cache."""
