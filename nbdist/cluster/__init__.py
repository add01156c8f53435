"""Worker processes for multi-worker strategies, started and run through ipyparallel.

Kernel and engines alike:

* ``tfconfig``     free ports and each worker's TF_CONFIG
* ``failures``     the errors a cluster raises, one traceback for N workers
* ``compat``       checks before setup: TensorFlow importable, same versions as the kernel
* ``withkernel``   local controller and engines end themselves once their kernel is gone

``engines/`` (kernel side): the processes that host workers

* ``local``        the ipyparallel controller and engines started here, and their cleanup
* ``profile``      ``--cluster PROFILE``: the engines of a cluster the user runs (never killed)
* ``hosts``        where those engines are: local or not, each worker's reachable address

``inengine/``: what runs inside the engine processes

* ``worker``       the strategy, the channel, heartbeats
* ``cells``        scope and step cells on a worker, Keras fit recording, the stop gate
* ``ps_server``    one ``tf.distribute.Server`` (parameter_server)

``multiworker/`` (kernel side)

* ``backend``      ``MultiWorkerCluster``, what the Session holds for ``multiworker``
* ``monitor``      the kernel's view of the workers: health, metric rows into Runs, stopping
* ``dispatch``     running a call on every worker: live output, failures, interrupts
* ``status``       ``%distribute status`` and the lab extension's state for a cluster
* ``models``       ``%distribute pull MODEL``: a worker's Keras model, rebuilt in the
                   kernel's Keras

``paramserver/`` (the kernel is the coordinator, the processes only host TF servers):

* ``backend``      ``ParameterServerCluster``, what the Session holds for it
* ``context``      the kernel's TensorFlow context as coordinator: connect, disconnect
* ``steps``        step mode scheduled with ``ClusterCoordinator``, rows into the Run
* ``fit``          tf_keras ``model.fit`` on the workers, recorded
* ``health``       the coordinator's view of its processes
* ``instrument``   the parameter-update timer inside the traced step
* ``status``       its ``%distribute status`` and lab-extension state

Under ``multiworker`` nothing here imports TensorFlow in the kernel (the kernel is never a
TensorFlow worker) but ``models``, when a model is pulled; under ``parameter_server`` the
kernel is the coordinator, and TensorFlow starts a gRPC server in it too.

Sockets: the telemetry channel, the ipyparallel controller, engines and nannies listen on
127.0.0.1 only (with ``--cluster`` on remote engines the channel binds the kernel's address
toward them, and the cluster's sockets are the user's). TensorFlow's gRPC server (one per
worker, on its TF_CONFIG port) listens on all interfaces whatever address TF_CONFIG gives, has
no authentication and no encryption, and runs any graph it is sent: on a shared network,
firewall those ports (see docs/guide/security.md).
"""
