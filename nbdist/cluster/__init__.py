"""Worker processes for multi-worker strategies, started and run through ipyparallel.

* ``tfconfig``     free ports and each worker's TF_CONFIG
* ``engines``      the ipyparallel controller and engines (local processes), and their cleanup
* ``worker``       what runs inside each engine: the strategy, the channel, heartbeats
* ``cells``        scope and step cells on a worker, Keras fit recording, the stop gate
* ``monitor``      the kernel's view of the workers: health, metric rows into Runs, stopping
* ``dispatch``     running a call on every worker: live output, failures, interrupts
* ``failures``     the errors a cluster raises, one traceback for N workers
* ``multiworker``  ``MultiWorkerCluster``, what the Session holds for ``multiworker``
* ``status``       ``%distribute status`` and the lab extension's state for a cluster

Nothing here imports TensorFlow in the kernel: the kernel is never a TensorFlow worker.

Sockets: the telemetry channel, the ipyparallel controller, engines and nannies listen on
127.0.0.1 only. TensorFlow's gRPC server (one per worker, on its TF_CONFIG port) listens on
all interfaces whatever address TF_CONFIG gives, has no authentication and no encryption,
and runs any graph it is sent: on a shared network, firewall those ports (see README).
"""
