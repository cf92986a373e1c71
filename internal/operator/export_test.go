package operator

// RiverJobsSQL is riverJobsSQL, for the plan test.
const RiverJobsSQL = riverJobsSQL
