"""Live traffic for a candidate version: shadow it, canary it, and judge it on its answers.

The Python half: the routes file (:mod:`.routes`), the evidence (:mod:`.evidence`), the canary watcher
(:mod:`.watcher`), and the commands on one server (:mod:`.local`) or in a cluster (:mod:`.cluster`, :mod:`.kubectl`).
The other half is the frontend's Java agent (agent/src/rtserve/agent/: Routes.java, Router.java, LiveLog.java).
"""
