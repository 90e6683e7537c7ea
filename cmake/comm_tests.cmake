# Tests of the rendezvous, symmetric memory and mailbox (issue 3).
