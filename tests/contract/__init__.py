"""The engine and driver contract: these tests run unchanged on every database the suite runs
on (JOBS_TEST_DB=sqlite, postgres, mysql); what one database cannot do is marked (needs(FLAG)
or postgres), never silently skipped."""
