# Rendezvous, symmetric memory and the Lamport mailbox (issue 3): sources
# added to the library here. Owned by the mailbox work.
