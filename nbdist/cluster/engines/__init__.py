"""The processes that host workers: ipyparallel engines started here (``local``) or those of a
cluster the user runs (``profile``), and where they are (``hosts``)."""
