// The storage account: every queue, table and container the code names (names.json), no
// shared keys (identities only), and the retention rules: the caches (sources, tiles) keep a
// blob while keeping it costs less than making it again (names.json's cacheRetention, by
// last access: tracking is on), the products and logs for retentionDays after they were written.

param name string
param location string
@description('Days after which products and logs are deleted (0: kept).')
param retentionDays int

var names = loadJsonContent('../names.json')

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: name
  location: location
  kind: 'StorageV2'
  sku: { name: 'Standard_LRS' }
  properties: {
    allowSharedKeyAccess: false
    allowBlobPublicAccess: false
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
  properties: {
    // a read or a write records the blob's last access (the first of each day): the caches' rules use it
    lastAccessTimeTrackingPolicy: { enable: true, name: 'AccessTimeTracking', trackingGranularityInDays: 1, blobType: [ 'blockBlob' ] }
  }
}

resource containers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = [for c in names.containers: {
  parent: blobService
  name: c
}]

// the Function App's deployment package (Flex Consumption reads it with its identity)
resource packages 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: 'app-package'
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource queues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [for q in names.queues: {
  parent: queueService
  name: q
}]

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource tables 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = [for t in names.tables: {
  parent: tableService
  name: t
}]

var cacheRules = [for c in names.cacheRetention: {
  name: 'keep-${c.container}-while-worth-it'
  enabled: true
  type: 'Lifecycle'
  definition: {
    filters: { blobTypes: [ 'blockBlob' ], prefixMatch: [ '${c.container}/' ] }
    actions: { baseBlob: { delete: { daysAfterLastAccessTimeGreaterThan: c.days } } }
  }
}]
var resultRules = retentionDays > 0 ? [
  {
    name: 'expire-results'
    enabled: true
    type: 'Lifecycle'
    definition: {
      filters: { blobTypes: [ 'blockBlob' ], prefixMatch: [for c in names.expiringContainers: '${c}/'] }
      actions: { baseBlob: { delete: { daysAfterModificationGreaterThan: retentionDays } } }
    }
  }
] : []

resource retention 'Microsoft.Storage/storageAccounts/managementPolicies@2023-05-01' = {
  parent: storage
  name: 'default'
  properties: { policy: { rules: concat(cacheRules, resultRules) } }
  dependsOn: [ blobService ]
}

output name string = storage.name
output id string = storage.id
output blobEndpoint string = storage.properties.primaryEndpoints.blob
