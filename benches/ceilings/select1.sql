-- One round trip that does nothing: the most a duplicate through PostgreSQL can approach.
SELECT 1;
