// bagpipe on Azure: storage (the queues, tables and containers the code names), the
// Function App (API, planner, completion, sweep) on Flex Consumption with a managed
// identity, and monitoring. Every storage name comes from names.json, which
// `python -m pipeline.names` writes from the code's one names module.
// Deploy: az deployment group create -g RG -f infra/bicep/main.bicep -p prefix=bagpipe

@description('Short prefix of every resource name (lowercase letters and digits).')
@minLength(3)
@maxLength(11)
param prefix string = 'bagpipe'

@description('Azure region.')
param location string = resourceGroup().location

@description('Most tasks of one job in the queues at once.')
param window int = 256

@description('Sender address of the completion emails (an Azure Communication Services domain).')
param mailSender string = ''

@description('Azure Communication Services endpoint; empty: no email.')
param acsEndpoint string = ''

var names = loadJsonContent('names.json')
var suffix = uniqueString(resourceGroup().id)
var storageName = take('${prefix}${suffix}', 24)

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: storageName
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
}

resource containers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = [for c in names.containers: {
  parent: blobService
  name: c
}]

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
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

resource logs 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: '${prefix}-logs-${suffix}'
  location: location
  properties: {
    sku: { name: 'PerGB2018' }
    retentionInDays: 30
  }
}

resource insights 'Microsoft.Insights/components@2020-02-02' = {
  name: '${prefix}-ai-${suffix}'
  location: location
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: logs.id
  }
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: '${prefix}-plan-${suffix}'
  location: location
  kind: 'functionapp'
  sku: { tier: 'FlexConsumption', name: 'FC1' }
  properties: { reserved: true }
}

resource functions 'Microsoft.Web/sites@2024-04-01' = {
  name: '${prefix}-fn-${suffix}'
  location: location
  kind: 'functionapp,linux'
  identity: { type: 'SystemAssigned' }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}app-package'
          authentication: { type: 'SystemAssignedIdentity' }
        }
      }
      scaleAndConcurrency: { maximumInstanceCount: 40, instanceMemoryMB: 2048 }
      runtime: { name: 'python', version: '3.11' }
    }
    siteConfig: {
      appSettings: [
        { name: 'AzureWebJobsStorage__accountName', value: storage.name }
        { name: names.settings.storageAccount, value: storage.name }
        { name: names.settings.shards, value: string(names.shards) }
        { name: names.settings.window, value: string(window) }
        { name: names.settings.mailMode, value: empty(acsEndpoint) ? 'none' : 'acs' }
        { name: names.settings.mailSender, value: mailSender }
        { name: names.settings.acsEndpoint, value: acsEndpoint }
        { name: 'APPLICATIONINSIGHTS_CONNECTION_STRING', value: insights.properties.ConnectionString }
      ]
    }
  }
}

// The narrowest data roles the app needs on its own account.
var roles = {
  blobOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b' // Storage Blob Data Owner (deployment package, SAS delegation)
  queueContributor: '974c5e8b-45b9-4653-ba55-5f855dd0fb88' // Storage Queue Data Contributor
  tableContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3' // Storage Table Data Contributor
}

resource grants 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for role in items(roles): {
  name: guid(storage.id, functions.id, role.value)
  scope: storage
  properties: {
    principalId: functions.identity.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role.value)
  }
}]

output apiUrl string = 'https://${functions.properties.defaultHostName}/api'
output storageAccount string = storage.name
